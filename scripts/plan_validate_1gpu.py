"""The planner's one-GPU predictions next to vanilla SGLang TP1: `python -m sgl_sidp.bench.validate_1gpu` (its doc)."""

from sgl_sidp.bench.validate_1gpu import main

if __name__ == "__main__":
    main()
