"""Trace replay benchmarking for SGLang servers: trace loaders and prompt reconstruction (``traces``), async
streaming clients (``client``), bench_serving's metrics plus goodput (``metrics``) and output files, report and
plot (``report``). The CLI is ``python -m sgl_sidp.replay``. No GPU code.

The names below are imported when first used (PEP 562), so that the planner, which reads traces only, does not import
the HTTP client (aiohttp: 0.3 s of every `python -m sgl_sidp.plan` run)."""

import importlib

_WHERE = {"RequestOutput": "client", "SLO": "metrics", "compute_metrics": "metrics", "PromptBuilder": "traces",
          "TraceRequest": "traces", "load_trace": "traces", "plan_replay": "traces"}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
