"""Reading a published Mixtrain dataset back: `reader` (open_dataset, the torch wrappers), its
`Dataset` (`dataset`; on Lance `lance_rows`), and the HTML report (`report`)."""
