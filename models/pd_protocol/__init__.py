"""models.pd_protocol"""
