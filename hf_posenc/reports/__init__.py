"""The results files a run writes and reads back: their schema."""
