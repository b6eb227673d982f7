"""Trace replay benchmarking for SGLang servers: trace loaders and prompt reconstruction (``traces``), async
streaming clients (``client``), bench_serving's metrics plus goodput (``metrics``) and output files, report and
plot (``report``). The CLI is ``python -m sgl_sidp.replay``. No GPU code."""

from sgl_sidp.bench.client import RequestOutput
from sgl_sidp.bench.metrics import SLO, compute_metrics
from sgl_sidp.bench.traces import PromptBuilder, TraceRequest, load_trace, plan_replay

__all__ = ["SLO", "PromptBuilder", "RequestOutput", "TraceRequest", "compute_metrics", "load_trace", "plan_replay"]
