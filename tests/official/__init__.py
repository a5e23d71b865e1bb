"""The authors' code, transcribed (each file cites its repository, path and commit): the references that
the loaders and fast paths of the package are tested against.  Never imported by the package itself."""
