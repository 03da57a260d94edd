"""Pure-Python reference models, one package per engine behaviour.

Each package states one upstream behaviour and its pre-fix variants and
exports its `DESCRIPTOR` (`kvsim.engine.descriptor.ModelDescriptor`) from
`__init__`. A model depends only on the `kvsim.engine` layer, never on
`kvsim.properties` or `kvsim.gpu_oracle`; `pd_common` is the vocabulary the
two PD models share, not a model.
"""

MODELS = (  # in the order the models were added; the catalog lists them so
    "swa_budget",
    "kv_zeroing",
    "mla_chunks",
    "pd_staging",
    "pd_protocol",
    "mla_backends",
    "pipelined_transfer",
    "kv_offload",
    "kv_cache_manager",
    "radix_cache",
)
