"""properties.pd_staging"""
