"""sgl-sidp: node-shared model weights for SGLang (ZeroDP, SiDP, Shift Parallelism).

Importing this package changes nothing in SGLang: the overlay enters only through
SGLang's plugin framework (`sgl_sidp.plugin.load`, entry point group
`sglang.srt.plugins`), and only when its settings turn it on.
"""

__version__ = "0.1.0"
