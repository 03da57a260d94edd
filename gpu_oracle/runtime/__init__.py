"""gpu_oracle.runtime"""
