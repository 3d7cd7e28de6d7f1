"""Fixed ids of the special tokens, shared by the tokenizer, the data store and the search."""

PAD_ID = 0
UNK_ID = 1
BOS_ID = 2
EOS_ID = 3
