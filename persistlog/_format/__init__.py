"""The format: its constants, the encoder and decoder, records as CBOR and JSON, the hash chain, encryption and signatures."""
