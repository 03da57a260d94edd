"""properties.mla_chunks"""
