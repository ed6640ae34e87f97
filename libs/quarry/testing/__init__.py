"""Contract suites a new backend runs by importing them (like lakeFS's kvtest and
blocktest): pytest test classes, each asking for one fixture that gives the implementation
under test.

    quarry.testing.kv.KVContract                the KV Store (`kv_store`)
    quarry.testing.blob.BlobContract            the BlobStore (`kind`: a StoreKind)
    quarry.testing.committed.CommittedContract  committed storage (`committed`)

Subclass one as `Test...` in a test module and define its fixture; pytest runs every test of
the contract against it. tests/ runs them for every backend of this repository. Needs pytest
(the dev extras)."""
