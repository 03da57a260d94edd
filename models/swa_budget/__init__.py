"""models.swa_budget"""
