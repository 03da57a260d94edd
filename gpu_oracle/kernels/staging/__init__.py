"""gpu_oracle.kernels.staging"""
