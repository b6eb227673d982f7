"""SiDP (Zhao & He, "SiDP: Memory-Efficient Data Parallelism for Offline LLM Inference"): each dense FFN
layer is owned by one DP rank; the other ranks stream it (WaS). See `feature.py` and `runtime.py`."""
