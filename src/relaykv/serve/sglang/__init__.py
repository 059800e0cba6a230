"""SGLang compatibility: SGLang's bootstrap P/D requests, paired through a room handshake
(`--sglang-bootstrap`) or refused with a 400 (docs/pd.md)."""
