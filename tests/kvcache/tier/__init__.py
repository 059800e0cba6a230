"""Tests of relaykv.kvcache.tier."""
