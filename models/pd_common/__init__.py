"""models.pd_common"""
