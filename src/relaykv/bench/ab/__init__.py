"""`relaykv bench ab`: A/B/A runs on fresh clusters, tables and plots."""
