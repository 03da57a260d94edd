"""gpu_oracle.kernels.mla_context"""
