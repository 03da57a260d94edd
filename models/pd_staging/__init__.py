"""models.pd_staging"""
