"""properties.swa_budget"""
