"""Apply an exported config to a training: the digits MLP under the config, with the precision
guard, as the README's apply block does it (tests/project/test_docs.py runs this file).

Run it:  python examples/apply_config.py [CONFIG]   (default: runs/best_precision.json from
`make demo`, else mixed_bfloat16). It trains the digits MLP for two epochs under the config
with the precision guard, and saves the config the guard ends with to repaired.json.
"""

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from digits_mlp import build_model, train_data  # noqa: E402 - your model and data, beside

from tuner import PrecisionConfig  # noqa: E402 - after the path above, as the example's

x, y = train_data()
if len(sys.argv) > 1:
    config_file = Path(sys.argv[1])
elif Path("runs/best_precision.json").is_file():
    config_file = Path("runs/best_precision.json")
else:  # no tune run yet: a config as one would be exported
    config_file = Path(tempfile.mkdtemp()) / "best_precision.json"
    PrecisionConfig(policy="mixed_bfloat16").save(config_file)

import keras  # noqa: E402 - the README's apply block, as pasted: its imports open it

from tuner import PrecisionConfig  # noqa: E402 - as above

cfg = PrecisionConfig.load(config_file)   # e.g. "best_precision.json"
with cfg.scope():                         # policy, floatx, epsilon, float32 layers
    model = build_model()
    model.compile(optimizer=keras.optimizers.Adam(1e-3),   # compiled as tuned: loss scale
                  loss="sparse_categorical_crossentropy")
    guard = cfg.guard()                   # watches the whole training, repairs it if needed
    model.fit(x, y, epochs=2, callbacks=[guard])
guard.events                              # what it saw and did, one GuardEvent per event
guard.config.save("repaired.json", overwrite=True)   # the config with its repairs

print(f"applied {cfg.describe()}: {len(guard.events)} guard events, final loss "
      f"{model.history.history['loss'][-1]:.4f}; the config now in effect: repaired.json")
