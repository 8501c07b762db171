"""The optimizer, its schedule, and its state allocated for a checkpoint to be loaded into."""

from __future__ import annotations

import copy

import torch

from spotray.config import ModelSection, TrainSection
from spotray.step.optim import allocate_state, build_optimizer, lr_factor
from spotray.tasks.gpt_model import GPT, GPTShape


def model_and_optimizer() -> tuple[GPT, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = GPT(GPTShape.from_config(ModelSection(preset="tiny"), vocab_size=257, block_size=16))
    return model, build_optimizer(model, TrainSection())


def layout(optimizer: torch.optim.Optimizer) -> list:
    return [{key: (value.shape, value.dtype, value.device) if torch.is_tensor(value) else value
             for key, value in optimizer.state[p].items()}
            for group in optimizer.param_groups for p in group["params"]]


def test_allocated_state_has_the_layout_a_first_step_creates_without_taking_a_step():
    model, stepped = model_and_optimizer()
    model(torch.zeros(1, 8, dtype=torch.long)).sum().backward()
    stepped.step()
    model, allocated = model_and_optimizer()
    before = [p.detach().clone() for p in model.parameters()]
    allocate_state(allocated)
    assert layout(allocated) == layout(stepped)
    assert all(p.grad is None for p in model.parameters())  # no gradients were made up for it
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_loading_a_saved_state_into_allocated_state_trains_on_identically():
    def train_step(model, optimizer):
        model(torch.arange(8).view(1, 8)).float().pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    model, optimizer = model_and_optimizer()
    train_step(model, optimizer)
    saved_model, saved_optim = copy.deepcopy(model.state_dict()), copy.deepcopy(optimizer.state_dict())
    train_step(model, optimizer)

    resumed_model, resumed = model_and_optimizer()
    allocate_state(resumed)
    resumed_model.load_state_dict(saved_model)
    for state, saved in zip(resumed.state.values(), saved_optim["state"].values(), strict=True):
        for key, value in saved.items():
            state[key].copy_(value)  # as DCP loads: into the allocated tensors
    train_step(resumed_model, resumed)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), resumed_model.parameters(), strict=True))


def test_learning_rate_warms_up_then_decays_to_its_floor():
    train = TrainSection(max_steps=100, warmup_steps=10, min_lr_ratio=0.1)
    assert lr_factor(0, train) == 0.1 and lr_factor(9, train) == 1.0
    assert lr_factor(100, train) == 0.1
