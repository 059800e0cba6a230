"""Tests of relaykv.transfer.tier."""
