"""kvsim.app"""
