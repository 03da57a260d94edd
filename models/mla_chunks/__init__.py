"""models.mla_chunks"""
