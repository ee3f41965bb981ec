"""Device discovery from recorded ``nvidia-smi -L`` listings (tuner.execution.gpus): whole GPUs
by index, MIG slices by their UUIDs (a split GPU is no device of its own), narrowed by
``CUDA_VISIBLE_DEVICES`` as the user or Ray sets it."""

from tuner.execution.gpus import devices_of, narrowed

EIGHT = "\n".join(f"GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-{i}a{i}b-0000-1111-2222)"
                  for i in range(8))
# An A100 split in three slices beside a whole one (the driver's own layout, UUIDs shortened).
SPLIT = """GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-5d5ba0d6-aaaa)
  MIG 3g.40gb     Device  0: (UUID: MIG-c6d4f1ef-0001)
  MIG 2g.20gb     Device  1: (UUID: MIG-cc0c6e5a-0002)
  MIG 1g.10gb     Device  2: (UUID: MIG-1e099852-0003)
GPU 1: NVIDIA A100-SXM4-80GB (UUID: GPU-8e1b7ad0-bbbb)
"""


def test_whole_gpus_are_devices_by_index_narrowed_by_cuda_visible_devices():
    devices = devices_of(EIGHT)
    assert narrowed(devices, None) == [str(i) for i in range(8)]
    assert narrowed(devices, "3,0") == ["3", "0"]                 # its order, as CUDA takes it
    assert narrowed(devices, "GPU-5a5b") == ["5"]                  # a UUID's unique prefix
    assert narrowed(devices, "GPU-2a2b-0000-1111-2222") == ["2"]
    assert narrowed(devices, "") == [] and narrowed(devices, "-1") == []
    assert narrowed(devices, "9") == []                           # no such GPU


def test_a_mig_split_gpu_gives_its_slices_not_itself():
    devices = devices_of(SPLIT)
    assert narrowed(devices, None) == ["MIG-c6d4f1ef-0001", "MIG-cc0c6e5a-0002",
                                       "MIG-1e099852-0003", "1"]
    assert narrowed(devices, "MIG-cc0c6e5a-0002") == ["MIG-cc0c6e5a-0002"]
    assert narrowed(devices, "MIG-1e09") == ["MIG-1e099852-0003"]
    assert narrowed(devices, "GPU-8e1b7ad0-bbbb,MIG-c6d4f1ef-0001") == ["1",
                                                                        "MIG-c6d4f1ef-0001"]
    # The split GPU's own UUID selects its slices; its index names no device (0 is no whole GPU).
    assert len(narrowed(devices, "GPU-5d5ba0d6-aaaa")) == 3
    assert narrowed(devices, "0") == []


def test_a_listing_without_gpus_or_with_other_lines_gives_none():
    assert devices_of("") == []
    assert devices_of("No devices were found\n") == []
    assert devices_of("NVIDIA-SMI has failed because it couldn't communicate with the driver.") \
        == []


def test_train_against_float32_shares_the_gpus_it_finds():
    from tuner.run.guarded_training import placement

    assert placement(["config"], ["0"]) == ([["config"]], {}, "")
    waves, devices, line = placement(["config", "float32"], [])
    assert waves == [["config", "float32"]] and devices == {} and "CPU" in line
    waves, devices, line = placement(["config", "float32"], ["MIG-c6d4f1ef-0001"])
    assert waves == [["config"], ["float32"]] and devices == {}
    waves, devices, _ = placement(["config", "float32"], ["3", "MIG-1e099852-0003", "5"])
    assert waves == [["config", "float32"]]
    assert devices == {"config": "3", "float32": "MIG-1e099852-0003"}
