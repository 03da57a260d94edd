"""properties.kv_zeroing"""
