"""Pure-Python reference models, one engine behaviour per module.

Each module states one upstream behaviour and its pre-fix variants; it
depends only on `kvsim` core, never on `properties` or `gpu_oracle`.
"""
