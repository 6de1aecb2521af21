"""The processes of one host agree on the step at which a ``SIGTERM`` stops them, whichever of them saw it and
however far apart they are: every interleaving of two processes' checks here is a real file shared through
``mmap`` and ``flock``, as between the processes of ``tpu_spawn``."""
import itertools
import os

import pytest

from pytorch_lightning.trainer.connectors.xla_preemption import _HostAgreement, _LocalAgreement

FIXED_BY = "0057-feature-xla-preemption.patch"


@pytest.fixture
def agreement_file():
    path = _HostAgreement.create()
    yield path
    os.unlink(path)


def _stops(schedule, signal_at, path, ranks=2):
    """Run the checks of ``ranks`` processes in the order ``schedule`` gives (a sequence of ranks); rank 0 is
    signalled just before its check number ``signal_at``. Returns the check at which each rank stopped."""
    agreements = [_HostAgreement(path, rank) for rank in range(ranks)]
    checks = [0] * ranks
    stopped = [None] * ranks
    try:
        for rank in schedule:
            if stopped[rank] is not None:
                continue
            checks[rank] += 1
            if rank == 0 and checks[rank] == signal_at:
                agreements[0].request()
            if agreements[rank].reached(checks[rank]):
                stopped[rank] = checks[rank]
    finally:
        for agreement in agreements:
            agreement.close()
    return stopped, checks


@pytest.mark.parametrize("lead", [-2, -1, 0, 1, 2])
@pytest.mark.parametrize("signal_at", [1, 3])
def test_every_rank_stops_at_the_same_check(agreement_file, lead, signal_at):
    """Rank 1 runs ``lead`` checks ahead of rank 0 (behind when negative); then they alternate."""
    head = [1] * lead if lead > 0 else [0] * -lead
    schedule = head + [0, 1] * 20
    stopped, _ = _stops(schedule, signal_at, agreement_file)
    assert stopped[0] is not None and stopped[0] == stopped[1]
    # nobody had passed the agreed check, and it comes at most two checks after the signalled one
    assert signal_at < stopped[0] <= signal_at + 1 + max(lead, 0)


def test_every_interleaving_agrees(agreement_file):
    """All orders of 4 checks per rank, with the signal at rank 0's second check."""
    for order in set(itertools.permutations([0] * 4 + [1] * 4)):
        with open(agreement_file, "r+b") as f:
            f.write(bytes(os.path.getsize(agreement_file)))
        schedule = list(order) + [0, 1] * 6
        stopped, _ = _stops(schedule, 2, agreement_file)
        assert stopped[0] is not None and stopped[0] == stopped[1], (order, stopped)


def test_no_signal_never_stops(agreement_file):
    stopped, checks = _stops([0, 1] * 50, signal_at=-1, path=agreement_file)
    assert stopped == [None, None] and checks == [50, 50]


def test_one_process_stops_at_its_next_check():
    agreement = _LocalAgreement()
    assert not agreement.reached(1)
    agreement.request()
    assert agreement.reached(2)
