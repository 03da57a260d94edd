"""models.kv_zeroing"""
