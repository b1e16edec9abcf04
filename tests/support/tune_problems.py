"""Make a real problems file on CPU: fp32 ``bmm`` in a training graph (forward and backward).

Run as a program (``python tests/support/tune_problems.py OUT``) so that the recording choices
handler never touches the test process's Inductor settings. Inductor's C++ GEMM template
offers a second candidate for two of the three problems (``--backends ATEN,CPP``).
"""

from __future__ import annotations

import sys

import torch
import torch._functorch.config as functorch_config
import torch._inductor.config as inductor_config

from titan_rocm.tuned_gemms import choices, problems


class BmmModel(torch.nn.Module):
    """``x @ w`` batched: one forward bmm, two backward bmms."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4, 32, 48))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.bmm(x, self.w)


def main(out: str) -> None:
    inductor_config.fx_graph_cache = False
    functorch_config.enable_autograd_cache = False
    found: list[problems.Problem] = []
    choices.install(choices.ChoicesFactory(lambda: choices.RecordingChoices(found.append)))
    x = torch.randn(4, 64, 32, requires_grad=True)
    torch.compile(BmmModel())(x).sum().backward()
    head = problems.header({"model": "bmm-test", "flavor": "tiny"}, {"device": "cpu"}, {},
                           "2026-01-01T00:00:00+00:00")
    with open(out, "wb") as f:
        f.write(problems.dumps(head, problems.merge(found)))


if __name__ == "__main__":
    main(sys.argv[1])
