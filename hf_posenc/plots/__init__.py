"""Every figure: results over length, passkey grids, and the encodings themselves."""
