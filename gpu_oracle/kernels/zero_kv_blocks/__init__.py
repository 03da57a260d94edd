"""gpu_oracle.kernels.zero_kv_blocks"""
