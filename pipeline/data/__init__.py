"""Parallel corpora: the registry of data sets, their download and verification, and their
cleaning into the plain-text corpus the tokenizer stage reads.

- ``spec``: the registry's types (``DatasetSpec``, ``Corpus``, ``Side``, ``RemoteFile``);
- ``multi30k``, ``wmt14``: one module per data set;
- ``registry``: name -> data set, and the check of the ``data`` params against it;
- ``checksums``: recorded hashes (trust on first use) and where they came from;
- ``fetch``: downloads from upstream or a mirror, verified, and archive extraction;
- ``read``: text / gzip / SGML sides read into aligned pairs;
- ``corpus``: cleaning, incoming data and the atomic corpus folder (``prepare_corpus``).

Import from the submodules: this file imports nothing, so that a stage that only checks params
(``registry``) does not load, and depend on, the download code.
"""
