"""relaykv.launch: `relaykv up`, starting and stopping a local P/D cluster."""
