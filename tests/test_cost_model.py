"""The cost model that load cannot break (treegraft/prune.py): a monotone T(n) from interleaved, repeated probes,
refined from rounds by medians, and a B_ver that moves at most one probe bucket per update. The probes' times
come from a scripted clock (no wall clock), so every assertion here is about the arithmetic, not this host."""
import numpy as np
import pytest

from treegraft.prune import Pruner, VerifyCost, bucket_of, isotonic, probe_sizes

QUIET = {0: 60.0, 1: 80.0, 3: 84.0, 5: 87.0, 7: 90.0, 11: 95.0, 15: 110.0, 23: 130.0, 31: 150.0, 47: 185.0,
         63: 220.0}  # ms per probe size (nodes)
CAP = 1.6


class ScriptedHost:
    """A target whose verifications take scripted times on a scripted clock: `slow` maps a call index to a
    factor (one probe 10x slow, say)."""

    def __init__(self, table=QUIET, slow=None):
        self.table, self.slow, self.now, self.calls = table, slow or {}, 0.0, 0
        self.device = None

    def clock(self) -> float:
        return self.now

    def start(self, ids):
        pass

    def rollback(self):
        pass

    def verify(self, tree, nodes):
        n = len(nodes) - 1
        self.now += self.table[n] * self.slow.get(self.calls, 1.0) / 1000
        self.calls += 1


def calibrated(host: ScriptedHost, budget: int = 63) -> Pruner:
    p = Pruner()
    p.calibrate(host, [1, 2, 3], budget, CAP, clock=host.clock)
    return p


def test_isotonic_fit_is_monotone_and_keeps_a_monotone_curve():
    rng = np.random.default_rng(0)
    for _ in range(50):
        y = rng.uniform(0, 100, 8)
        fit = isotonic(y, rng.uniform(0.5, 3, 8))
        assert np.all(np.diff(fit) >= -1e-9) and fit.shape == y.shape
    y = np.array([1.0, 2.0, 2.0, 5.0])
    assert isotonic(y, np.ones(4)).tolist() == y.tolist()


def test_quiet_calibration_sets_b_ver_from_the_curve():
    p = calibrated(ScriptedHost())
    assert p.verify_cost.ms == pytest.approx(QUIET)  # every probe measured 3 times, medians, monotone already
    assert p.host_budget(63, CAP) == 11  # T(11) = 95 <= 96 = 1.6 T(0); T(15) = 110 is not
    steeper = calibrated(ScriptedHost({**QUIET, 11: 100.0}))
    assert steeper.host_budget(63, CAP) == 7  # the half bucket over the cap: the octave below


@pytest.mark.parametrize("victim", range(1, 1 + 3 * len(QUIET)))
def test_one_probe_ten_times_slower_leaves_b_ver_within_one_bucket(victim):
    """Whichever single probe a burst of load hits (call 0 is the warm-up), B_ver stays within one bucket."""
    quiet = calibrated(ScriptedHost()).host_budget(63, CAP)
    noisy = calibrated(ScriptedHost(slow={victim: 10.0})).host_budget(63, CAP)
    sizes = probe_sizes(63)
    assert abs(bucket_of(noisy, sizes) - bucket_of(quiet, sizes)) <= 1


def test_a_uniformly_slower_host_keeps_its_b_ver():
    """Another process on the cores slows every forward alike: the ratios, and so B_ver, stay."""
    busy = {n: 2.3 * t for n, t in QUIET.items()}
    assert calibrated(ScriptedHost(busy)).host_budget(63, CAP) == calibrated(ScriptedHost()).host_budget(63, CAP)


def test_b_ver_moves_at_most_one_bucket_per_update():
    """Where no calibration probed the curve (only rounds measure it), B_ver follows the rounds one bucket at a time."""
    p, sizes = Pruner(), probe_sizes(63)
    for n, ms in QUIET.items():
        p.verify_cost.observe(n, ms)
    p.update_host_budget(63, CAP)
    before = bucket_of(p.host_b, sizes)
    for _ in range(9):  # rounds find 8-token forwards much slower (load on them only)
        p.verify_cost.observe(7, 400.0)
        p.update_host_budget(63, CAP)
        after = bucket_of(p.host_b, sizes)
        assert abs(after - before) <= 1
        before = after
    assert p.host_b == 5  # it got there, one bucket at a time


def test_rounds_refine_the_cuts_curve_and_leave_b_ver_to_the_probes():
    """Verified rounds time their forwards after drafting, at the sizes the cut chose: slower per node than the
    calibration's back-to-back probes. They refine T(n) for the cut; B_ver stays where the probes put it."""
    from treegraft.tree import SMALL, DraftTree, add_child

    p = calibrated(ScriptedHost())
    b = p.host_budget(63, CAP)
    tree = DraftTree.new(1, capacity=16)
    for i in range(15):  # a chain of 15 nodes under the root
        add_child(tree, i, 7, -0.5, SMALL, 1)
    for _ in range(30):
        p.learn(tree, np.arange(1, 16), [0], 2.0 * QUIET[15], None, 63, CAP, round_ms=250.0)
    assert np.median(p.verify_cost.samples[15]) == 2 * QUIET[15]  # the cut prices what rounds measured
    assert p.verify_cost.ms[15] > 1.5 * QUIET[15]
    assert p.probe_cost.ms == pytest.approx(QUIET) and p.host_budget(63, CAP) == b
    uncalibrated = Pruner()  # no probes: the rounds' curve is all B_ver has
    for n, ms in QUIET.items():
        uncalibrated.verify_cost.observe(n, ms)
    uncalibrated.learn(tree, np.arange(1, 12), [0], QUIET[11], None, 63, CAP)
    assert uncalibrated.host_b == 11


def test_rounds_refine_the_curve_by_median():
    c = VerifyCost()
    for ms in (50, 51, 49, 500, 52):  # one outlier among five rounds
        c.observe(0, ms)
    c.observe(7, 70)
    assert c.ms[0] == pytest.approx(51)


def test_calibration_keeps_the_thread_count_whose_curve_is_cheaper():
    """Beside a busy process one thread can beat two: the calibration probes both, interleaved, keeps the count
    whose timings are lower, sets it for the process, and seeds T(n) with that count's timings."""
    import torch

    before = torch.get_num_threads()

    class ThreadedHost(ScriptedHost):
        def verify(self, tree, nodes):
            slow = 2.5 if torch.get_num_threads() > 1 else 1.0  # two threads fight a busy neighbour
            self.now += QUIET[len(nodes) - 1] * slow / 1000

    try:
        host = ThreadedHost()
        p = Pruner()
        p.calibrate(host, [1, 2, 3], 63, CAP, clock=host.clock, threads=[2, 1])
        assert p.threads == 1 and torch.get_num_threads() == 1
        assert p.verify_cost.ms == pytest.approx(QUIET)  # the chosen count's timings only
    finally:
        torch.set_num_threads(before)


def test_background_load_runs_busy_processes_and_stops_them():
    from treegraft.load import background_load

    with background_load(2) as procs:
        assert len(procs) == 2 and all(p.is_alive() for p in procs)
    assert not any(p.is_alive() for p in procs)


def test_lead_rows_take_the_likely_nodes_while_a_batched_row_is_cheaper_than_its_expected_lone_one():
    """The verification's lead rows: the kept nodes by pi, most likely first, while pi x H(1) > H(m+1) - H(m), on
    any branch. Head cost scripted: one row alone 4 ms, each further row in the call 0.5 ms, so nodes with pi >
    0.125 join."""
    from treegraft.tree import SMALL, DraftTree, add_child

    p = Pruner()
    for rows, ms in ((1, 4.0), (2, 4.5), (4, 5.5), (8, 7.5)):
        p.head_cost.observe(rows - 1, ms)
    tree = DraftTree.new(5, capacity=16)
    a, _ = add_child(tree, 0, 10, np.log(0.9), SMALL, 1)   # pi 0.9
    b, _ = add_child(tree, 0, 11, np.log(0.05), SMALL, 1)  # a sibling, less likely
    c, _ = add_child(tree, a, 12, np.log(0.5), SMALL, 2)   # pi 0.45
    d, _ = add_child(tree, c, 13, np.log(0.2), SMALL, 3)   # pi 0.09: below 0.125, stays lazy
    nodes = np.array([0, a, b, c, d])
    assert p.lead_rows(tree, nodes) == [1, 3]  # rows of a and c in root + kept
    assert p.lead_rows(tree, np.array([0, b])) == []  # pi 0.05: not worth a row
    e, _ = add_child(tree, 0, 14, np.log(0.3), SMALL, 1)  # a competing branch under the root (the head's, say)
    f, _ = add_child(tree, e, 15, np.log(0.5), SMALL, 2)  # pi 0.15
    assert p.lead_rows(tree, np.array([0, a, b, c, d, e, f])) == [1, 3, 5, 6]  # a, c, then e and f on the other branch
    assert p.lead_rows(tree, np.array([0, a, b, c, d, e, f]), "path") == [1, 3]  # one path: e and f stay lazy
    chain = DraftTree.new(5, capacity=16)
    for depth in range(1, 13):  # a long copied span: pi 0.97^depth, past the 8 rows the calibration timed
        add_child(chain, depth - 1, 20 + depth, np.log(0.97), SMALL, 1)
    # past 8 rows each row costs the last timed segment's 0.5 ms: every node with pi x 4 > 0.5 joins
    assert p.lead_rows(chain, np.arange(13)) == list(range(1, 13))
    for rows, ms in ((4, 5.5), (8, 25.5)):  # a head whose batched calls grow steeply past 4 rows (5 ms a row)
        for _ in range(9):
            p.head_cost.observe(rows - 1, ms)
    assert p.lead_rows(chain, np.arange(13)) == [1, 2, 3]  # the 4th row (+5 ms) costs more than 0.97^4 x 4
    assert Pruner().lead_rows(tree, nodes) == []  # no head cost measured (an eager target): no lead
    assert p.token_row_ms() == pytest.approx(0.5)  # the cut counts an accepted token's row at the batched cost
    lone = Pruner()
    lone.row_ms = 4.2
    assert lone.token_row_ms() == 4.2  # without the head's curve: a lazily computed row


def test_a_lazy_targets_calibration_times_the_head_by_rows():
    class LazyHost(ScriptedHost):
        lead_rows = True

        def head_ms(self, rows, clock):
            t0 = clock()
            self.now += (4.0 + 0.5 * (rows - 1)) / 1000
            return 1000 * (clock() - t0)

    p = calibrated(LazyHost())
    assert p.head_cost.ms == pytest.approx({0: 4.0, 1: 4.5, 3: 5.5, 7: 7.5, 15: 11.5})
    assert not calibrated(ScriptedHost()).head_cost  # an eager target: nothing to time
