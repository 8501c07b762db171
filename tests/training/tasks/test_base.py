"""``LanguageModelTask.loss``: the summed cross-entropy of each next token, in float32 whatever the logits' dtype, and
compiled with ``train.compile`` (eager, its upcast copies the logits, the largest tensor of a step at a GPT-2
vocabulary)."""

import torch
import torch._dynamo.utils

from spotray.tasks.base import LanguageModelTask
from tests.training.configs import make_config
from tests.training.tasks.test_gpt_model import tiny


def loss_and_grads(compile_: bool) -> tuple[torch.Tensor, list[torch.Tensor | None], int]:
    """The loss of a bf16 batch, its gradients, and the graphs dynamo compiled for it."""
    cfg = make_config("/data", "/ckpt", "loss", f"train.compile={str(compile_).lower()}")
    model = tiny()
    batch = torch.randint(0, 257, (3, 17), generator=torch.Generator().manual_seed(0))
    torch._dynamo.reset()  # a graph compiled earlier in this process would be reused, not counted
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, units = LanguageModelTask(cfg).loss(model, batch)
    loss.backward()
    assert units == 3 * 16 and loss.dtype == torch.float32
    return loss, [p.grad for p in model.parameters()], torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs


def test_with_train_compile_the_loss_is_compiled_and_equals_the_eager_one():
    eager, eager_grads, eager_graphs = loss_and_grads(compile_=False)
    compiled, compiled_grads, compiled_graphs = loss_and_grads(compile_=True)
    assert eager_graphs == 0 and compiled_graphs == 1
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-4)
    for got, want in zip(compiled_grads, eager_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
