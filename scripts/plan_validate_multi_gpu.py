"""The planner's predictions next to a multi-GPU measurement: `python -m sgl_sidp.bench.validate` (its doc)."""

from sgl_sidp.bench.validate import main

if __name__ == "__main__":
    main()
