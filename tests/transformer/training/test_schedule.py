"""transformer/training/schedule.py: the learning rate of eq. 3 and Adam with the paper's betas (§5.3)."""

import pytest
import torch

from transformer.training.schedule import (
    cooldown_factor,
    inverse_sqrt_lr,
    learning_rate,
    make_optimizer,
    make_scheduler,
    rates_agree,
)

pytestmark = pytest.mark.fast


def paper_lr(step, d_model=512, warmup=4000):
    return d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)


def test_known_steps():
    # Written out: step 1 -> 512^-0.5 * 1 * 4000^-1.5; step 4000 -> 512^-0.5 * 4000^-0.5;
    # step 16000 -> 512^-0.5 * 16000^-0.5.
    assert inverse_sqrt_lr(1, 512, 4000) == pytest.approx(512 ** -0.5 * 4000 ** -1.5, rel=1e-12)
    assert inverse_sqrt_lr(1, 512, 4000) == pytest.approx(1.746928e-7, rel=1e-6)
    assert inverse_sqrt_lr(4000, 512, 4000) == pytest.approx(512 ** -0.5 * 4000 ** -0.5, rel=1e-12)
    assert inverse_sqrt_lr(4000, 512, 4000) == pytest.approx(6.987712e-4, rel=1e-6)
    assert inverse_sqrt_lr(16000, 512, 4000) == pytest.approx(512 ** -0.5 * 16000 ** -0.5, rel=1e-12)
    assert inverse_sqrt_lr(16000, 512, 4000) == pytest.approx(3.493856e-4, rel=1e-6)
    # Half the peak rate at 4 x warmup.
    assert inverse_sqrt_lr(16000, 512, 4000) == pytest.approx(inverse_sqrt_lr(4000, 512, 4000) / 2, rel=1e-12)


def test_formula_everywhere_and_peak_at_warmup():
    steps = [1, 2, 10, 100, 3999, 4000, 4001, 10000, 100000]
    for step in steps:
        assert inverse_sqrt_lr(step, 512, 4000) == pytest.approx(paper_lr(step), rel=1e-12)
    assert inverse_sqrt_lr(100, 512, 4000) == pytest.approx(100 * inverse_sqrt_lr(1, 512, 4000), rel=1e-12)  # linear
    rates = [inverse_sqrt_lr(s, 512, 4000) for s in range(1, 20001, 7)]
    assert max(rates) <= inverse_sqrt_lr(4000, 512, 4000)


def test_step_zero_and_scale():
    assert inverse_sqrt_lr(0, 512, 4000) == inverse_sqrt_lr(1, 512, 4000)
    assert inverse_sqrt_lr(500, 256, 100, scale=2.0) == pytest.approx(2 * 256 ** -0.5 * 500 ** -0.5, rel=1e-12)


def test_adam_hyperparameters():
    params = [torch.nn.Parameter(torch.zeros(3))]
    opt = make_optimizer(params)
    assert isinstance(opt, torch.optim.Adam)
    group = opt.param_groups[0]
    assert group["betas"] == (0.9, 0.98)
    assert group["eps"] == 1e-9
    assert group["weight_decay"] == 0.0
    decayed = make_optimizer([torch.nn.Parameter(torch.zeros(1))], weight_decay=0.01)
    assert decayed.param_groups[0]["weight_decay"] == 0.01


def test_scheduler_gives_rate_of_step_n_at_update_n():
    param = torch.nn.Parameter(torch.zeros(()))
    opt = make_optimizer([param], fused=False)
    sched = make_scheduler(opt, 512, 4000)
    checks = {1: 1.746928e-7, 2: 2 * 1.746928e-7, 4000: 6.987712e-4, 16000: 3.493856e-4}
    seen = {}
    for update in range(1, 16001):
        if update in checks:
            seen[update] = opt.param_groups[0]["lr"]  # the rate this update uses
        opt.step()  # no gradient: Adam skips the parameter, the schedule still advances
        sched.step()
    for update, expected in checks.items():
        assert seen[update] == pytest.approx(expected, rel=1e-6), update
        assert seen[update] == pytest.approx(paper_lr(update), rel=1e-12)


def test_first_updates_move_weights_by_the_scheduled_rate():
    # Adam's first update is lr * g / (|g| + eps) = lr * sign(g): the step size shows the rate.
    param = torch.nn.Parameter(torch.tensor([1.0, -1.0]))
    opt = make_optimizer([param])
    sched = make_scheduler(opt, d_model=16, warmup_steps=10, scale=2.0)
    before = param.detach().clone()
    param.grad = torch.tensor([3.0, -5.0])
    opt.step()
    sched.step()
    expected = inverse_sqrt_lr(1, 16, 10, 2.0)
    assert expected == pytest.approx(2 * 16 ** -0.5 * 10 ** -1.5)
    assert torch.allclose(before - param.detach(), torch.tensor([expected, -expected]), rtol=1e-5)
    assert opt.param_groups[0]["lr"] == pytest.approx(inverse_sqrt_lr(2, 16, 10, 2.0), rel=1e-12)


def test_scheduler_state_round_trip():
    opt = make_optimizer([torch.nn.Parameter(torch.zeros(1))], fused=False)
    sched = make_scheduler(opt, 64, 10)
    for _ in range(25):
        opt.step()
        sched.step()
    state = sched.state_dict()
    opt2 = make_optimizer([torch.nn.Parameter(torch.zeros(1))], fused=False)
    sched2 = make_scheduler(opt2, 64, 10)
    opt2.load_state_dict(opt.state_dict())
    sched2.load_state_dict(state)
    assert opt2.param_groups[0]["lr"] == pytest.approx(inverse_sqrt_lr(26, 64, 10), rel=1e-12)
    opt2.step()
    sched2.step()
    assert opt2.param_groups[0]["lr"] == pytest.approx(inverse_sqrt_lr(27, 64, 10), rel=1e-12)


def test_cooldown_factor_falls_linearly_over_the_last_updates():
    # max_steps 10, cool-down 4: updates 1-6 at eq. 3's rate, 7-10 at 4/4, 3/4, 2/4, 1/4 of it.
    assert [cooldown_factor(n, 10, 4) for n in range(1, 11)] == [1.0] * 6 + [1.0, 0.75, 0.5, 0.25]
    assert [cooldown_factor(n, 10, 0) for n in (1, 10, 11)] == [1.0, 1.0, 1.0]   # none: eq. 3 alone
    assert cooldown_factor(10, 10, 10) == 0.1 and cooldown_factor(1, 10, 10) == 1.0
    assert cooldown_factor(12, 10, 4) == 0.25   # past max_steps (the scheduler's rate after the last update)
    assert learning_rate(8, 64, 4, 2.0, 10, 4) == pytest.approx(0.75 * inverse_sqrt_lr(8, 64, 4, 2.0), rel=1e-12)
    # Without a cool-down the rate is eq. 3's to the last bit (the default run's weights do not move).
    assert all(learning_rate(n, 256, 300, 0.6) == inverse_sqrt_lr(n, 256, 300, 0.6) for n in range(1, 5000, 37))


def test_scheduler_with_cooldown_gives_each_update_its_rate():
    param = torch.nn.Parameter(torch.zeros(()))
    opt = make_optimizer([param], fused=False)
    sched = make_scheduler(opt, 64, 4, scale=1.0, max_steps=10, cooldown_steps=4)
    seen = []
    for _ in range(10):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    expected = [inverse_sqrt_lr(n, 64, 4) * f for n, f in zip(range(1, 11), [1.0] * 7 + [0.75, 0.5, 0.25])]
    assert seen == pytest.approx(expected, rel=1e-12)


def test_rates_agree_while_the_updates_made_had_the_same_rates():
    assert rates_agree(7, (10, 4), (20, 4))       # the first cooled update (7) keeps 4/4 of eq. 3
    assert not rates_agree(8, (10, 4), (20, 4))   # update 8 was cooled in the first only
    assert rates_agree(10, (10, 4), (10, 4))      # the same schedule
    assert rates_agree(100, (10, 0), (50, 0))     # eq. 3 alone: any limit
    assert rates_agree(7, (10, 0), (10, 4)) and not rates_agree(8, (10, 0), (10, 4))
    assert not rates_agree(10, (10, 4), (10, 5))
