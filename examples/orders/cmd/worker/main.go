// Command worker is the orders app's one Lambda binary: the construct runs
// it as the worker, the DLQ consumer and the dispatch guard, telling each
// its role in NEXJOB_ROLE.
package main

import (
	"github.com/nexjob/nexjob-aws/examples/orders"
	"github.com/nexjob/nexjob-aws/lambdamain"
)

func main() { lambdamain.Serve(orders.Registry(), nil) }
