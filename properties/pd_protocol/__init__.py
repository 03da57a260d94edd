"""properties.pd_protocol"""
