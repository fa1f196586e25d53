"""ASSD (seed 004): any-subset speculative decoding with an any-subset AR model (XLNet), lossless, with infilling:
`decoding` (the algorithm and its drafters), `server` (its OpenAI-compatible server)."""
