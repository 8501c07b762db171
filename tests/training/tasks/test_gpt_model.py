import pytest
import torch
import torch.nn.functional as F

from spotray.config import ModelSection
from spotray.tasks.gpt_model import GPT, Block, GPTShape


def tiny(**kw) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTShape.from_config(ModelSection(preset="tiny", **kw), vocab_size=257, block_size=16))


def test_logits_shape_and_tied_embeddings():
    model = tiny()
    assert model.shape.vocab_size == 320  # rounded up to a multiple of 64
    assert model(torch.randint(0, 257, (3, 16))).shape == (3, 16, 320)
    assert model.lm_head.weight is model.wte.weight


def test_attention_is_causal():
    model = tiny().eval()
    x = torch.randint(0, 257, (1, 16))
    y = x.clone()
    y[0, 10:] = (y[0, 10:] + 1) % 257
    assert torch.equal(model(x)[0, :10], model(y)[0, :10])
    assert not torch.equal(model(x)[0, 10:], model(y)[0, 10:])


def test_learns_a_repeated_sequence():
    model = tiny()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)  # 1e-2 oscillates on some CPUs
    x = torch.arange(17).unsqueeze(0) % 5
    for _ in range(60):
        loss = F.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.1


@pytest.mark.parametrize("preset,millions", [("gpt2-124m", 124), ("gpt2-350m", 354)])
def test_presets_have_gpt2_sizes(preset, millions):
    with torch.device("meta"):
        model = GPT(GPTShape.from_config(ModelSection(preset=preset), vocab_size=50257, block_size=1024))
    assert round(model.num_parameters() / 1e6) == pytest.approx(millions, abs=2)


def test_a_model_built_on_the_meta_device_is_materialised_tied_and_fully_initialised():
    with torch.device("meta"):
        model = GPT(GPTShape.from_config(ModelSection(preset="tiny"), vocab_size=257, block_size=16))
    model.to_empty(device="cpu")
    model.tie_weights()
    model.init_weights()
    assert model.wte.weight is model.lm_head.weight
    assert model.ln_f.weight.eq(1).all() and model.ln_f.bias.eq(0).all()
    first = model.blocks[0]
    assert isinstance(first, Block)
    assert first.attn.qkv.bias.eq(0).all()
    assert 0.015 < first.attn.qkv.weight.std().item() < 0.025
    logits = model(torch.zeros(1, 4, dtype=torch.long))
    assert torch.isfinite(logits).all()
