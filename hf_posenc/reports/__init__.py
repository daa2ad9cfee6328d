"""The results files a run writes and reads back: their schema, and the typed reports they hold."""
