package handler

// FlowName exposes the name a flow-control item is hashed from, for tests
// that fill a key's log directly.
var FlowName = flowName
