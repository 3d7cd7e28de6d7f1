"""transformer/training/update_ledger.py: the applied count, the rate and the non-finite record on the device."""

import pytest
import torch

from transformer.training.schedule import inverse_sqrt_lr
from transformer.training.update_ledger import LedgerReading, UpdateLedger

pytestmark = pytest.mark.fast


def rate(n):
    return inverse_sqrt_lr(n, 32, 4)


def flag(value):
    return torch.tensor(value)


def test_the_rate_follows_applied_updates_only():
    ledger = UpdateLedger(torch.device("cpu"), applied=5, rate=rate)
    ledger.plan(5, horizon=4)
    rates = []
    for skipped in (False, True, True, False):
        rates.append(float(ledger.next_rate()))
        ledger.record(flag(skipped), flag(False), torch.tensor(1.0))
    # Update 6 ran at step 6's rate; the two skipped ones asked for step 7's and left it for the next.
    assert rates == [rate(6), rate(7), rate(7), rate(7)]
    assert ledger.read() == LedgerReading(applied=7, non_finite=0, first_non_finite_step=0)


def test_non_finite_updates_are_counted_with_the_step_of_the_first():
    ledger = UpdateLedger(torch.device("cpu"), applied=0, rate=rate)
    ledger.plan(0, horizon=5)
    for skipped, non_finite, norm in ((False, False, 2.0), (True, True, float("nan")), (False, False, 3.0),
                                      (True, True, float("inf")), (True, False, float("inf"))):
        applied = ledger.record(flag(skipped), flag(non_finite), torch.tensor(norm))
        assert bool(applied) is not skipped
    assert float(ledger.grad_norm) == 3.0   # the last applied update's
    assert ledger.read() == LedgerReading(applied=2, non_finite=2, first_non_finite_step=2)
    assert ledger.read() == LedgerReading(applied=2, non_finite=0, first_non_finite_step=0)   # read once


def test_the_rates_are_the_schedules_own_floats():
    """The rate on the device is the float the host's schedule gives, bit for bit (float64)."""
    ledger = UpdateLedger(torch.device("cpu"), applied=0, rate=rate)
    ledger.plan(1000, horizon=50)
    ledger.applied.fill_(1000)
    for n in range(1001, 1051):
        assert ledger.next_rate().item() == rate(n)
        ledger.record(flag(False), flag(False), torch.tensor(1.0))


def test_an_update_beyond_the_planned_horizon_is_refused():
    ledger = UpdateLedger(torch.device("cpu"), applied=0, rate=rate)
    ledger.plan(0, horizon=1)
    ledger.next_rate()
    ledger.record(flag(False), flag(False), torch.tensor(1.0))
    with pytest.raises(IndexError):
        ledger.next_rate()
