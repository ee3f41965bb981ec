"""The warm pool's rules (tuner.execution.pool_book), without Ray: lending, one timed phase
per node, no starved lock, and jobs whose driver died."""

import pytest

from tuner.execution.pool_book import SLOT, TIMING, PoolBook


def _book(nodes=("n1", "n2"), slots=2) -> PoolBook:
    book = PoolBook()
    for node in nodes:
        for index in range(slots):
            book.add(f"{node}-s{index}", node, SLOT)
        book.add(f"{node}-t", node, TIMING)
    return book


def test_workers_are_lent_to_one_job_at_a_time_spread_over_the_nodes():
    book = _book()
    first = book.borrow("A", 2)
    assert sorted(book.workers[n].node for n in first) == ["n1", "n2"]
    second = book.borrow("B", 5)
    assert len(second) == 2 and not set(first) & set(second)
    assert book.borrow("C", 1) == []                      # all four slots are lent
    assert all(book.workers[n].kind == SLOT for n in first + second)
    book.give_back("B", second[:1])
    assert book.borrow("C", 1) == second[:1]
    book.give_back("A", second[1:])                       # not A's: nothing happens
    assert book.workers[second[1]].holder == "B"


def test_a_lock_waits_for_other_jobs_trials_and_holds_back_new_ones():
    book = _book(nodes=("n1",))
    (a,) = book.borrow("A", 1)
    (b,) = book.borrow("B", 1)
    assert book.begin("B", b)
    assert book.lock("A") is None              # B runs a trial on the only node
    assert not book.begin("B", b)              # ... and may not start another: A waits to lock
    assert not book.end("B", b)                # B's trial ran alone
    assert book.lock("A") == "n1-t"
    assert book.begin("A", a)                  # the locking job itself may go on
    book.end("A", a)
    assert not book.begin("B", b)              # locked: B waits
    book.unlock("A")
    assert book.begin("B", b) and book.locks == {} and book.pending == {}


def test_a_job_prefers_a_free_node_and_leaves_no_stale_claim():
    book = _book()
    (a,) = book.borrow("A", 1)
    others = book.borrow("B", 3)
    busy = [n for n in others if book.workers[n].node == book.workers[a].node]
    assert book.begin("B", busy[0])
    assert book.lock("A") == f"{'n2' if book.workers[a].node == 'n1' else 'n1'}-t"
    assert book.pending == {}
    assert book.lock("B") is not None and len(book.locks) == 2   # one timed phase per node
    assert book.lock("C") is None


def test_trials_side_by_side_on_a_node_are_marked_shared():
    book = _book(nodes=("n1",))
    a, b = book.borrow("A", 2)
    assert book.begin("A", a)
    assert not book.end("A", a)                # alone
    assert book.begin("A", a) and book.begin("A", b)
    assert book.end("A", a) and book.end("A", b)


def test_a_dead_jobs_workers_come_back_and_its_running_ones_are_named_for_replacement():
    book = _book(nodes=("n1",), slots=3)
    lent = book.borrow("dead", 2)
    (alive,) = book.borrow("alive", 1)
    assert book.begin("dead", lent[0])
    assert book.lock("dead") == "n1-t"         # its own trial does not hold it back
    replace = book.reap(lambda holder: holder != "dead")
    assert replace == [lent[0]]
    assert book.locks == {} and book.pending == {}
    assert sorted(book.borrow("new", 3)) == sorted(lent)
    assert book.workers[alive].holder == "alive"
    assert book.reap(lambda holder: True) == []


def test_the_status_table_counts_busy_lent_and_idle_per_node():
    book = _book(nodes=("n1",), slots=3)
    a, b = book.borrow("A", 2)
    book.begin("A", a)
    (row,) = book.table()
    assert (row["slots"], row["busy"], row["lent"], row["idle"]) == (3, 1, 1, 1)
    assert row["holders"] == ["A"] and row["timing"] == "-"
    book.end("A", a)
    assert book.lock("A") == "n1-t"
    assert book.table()[0]["timing"] == "A"


@pytest.mark.fast  # imports Ray, whose import may start a subprocess (Ray 2.40's GPU probe)
def test_a_jobs_task_check_on_a_borrowed_worker_takes_turns_with_timed_phases(monkeypatch):
    """The task check, ceiling probe and diagnostics are TensorFlow work on the borrowed
    worker like a trial: they wait while another job times on the node, and that job's lock
    waits for them (tuner.execution.ray_pool.RayExecutor._call)."""
    import ray

    from tuner.execution.ray_pool import RayExecutor
    from tuner.execution.ray_slots import Slot

    book = _book(nodes=("n1",))
    (mine,) = book.borrow("B", 1)
    book.borrow("A", 1)
    assert book.lock("A") == "n1-t"                       # A is timing on the node
    events = []

    class Lender:                   # the keeper's book, as Lender reaches it through Ray
        def begin(self, name, announce):
            while not book.begin("B", name):
                events.append("held back")
                book.unlock("A")                         # A's re-measurement ends
            events.append("began")

        def end(self, name):
            events.append("ended")
            return book.end("B", name)

    class Worker:
        class check_task:
            @staticmethod
            def remote(*args):
                events.append("checked")
                events.append("A's lock: " + str(book.lock("A")))
                return {"ok": True}

    executor = RayExecutor.__new__(RayExecutor)
    executor.workers, executor.announce, executor._lender = 1, None, Lender()
    executor._slots = [Slot(Worker(), "n1", name=mine)]
    executor.task_source_cache = {"t.py": {"digest": "d", "ref": []}}
    monkeypatch.setattr(ray, "get", lambda ref, timeout=None: ref)
    assert executor.probe("t.py", 3) == {"ok": True}
    assert events == ["held back", "began", "checked", "A's lock: None", "ended"]
    assert not book.workers[mine].running and book.lock("A") == "n1-t"
