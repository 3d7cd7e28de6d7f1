"""The form of the text a model reads and writes (raw, or the Multi30k literature's lowercased and
Moses-tokenized form): preparing corpora and requests alike."""
