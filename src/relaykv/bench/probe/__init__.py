"""`relaykv probe`: the seed's fixed-engine P/D prefix-cache probe."""
