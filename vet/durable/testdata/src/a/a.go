package a

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/nexjob/nexjob-aws/handler"
)

func charge(context.Context) (int, error) { return 1, nil }

func work(ctx context.Context, ids []string, tenants map[string]int, args struct{ Order string }) error {
	// Good: constant names, names from a loop index and from the args,
	// every wait's error returned.
	if _, err := handler.Step(ctx, "charge", charge); err != nil {
		return err
	}
	for i := range ids {
		if _, err := handler.Step(ctx, fmt.Sprintf("line-%d", i), charge); err != nil {
			return err
		}
	}
	if _, err := handler.Step(ctx, "order-"+args.Order, charge); err != nil {
		return err
	}
	if err := handler.Sleep(ctx, "cool-off", time.Hour); err != nil {
		return err
	}

	// Bad.
	handler.Sleep(ctx, "nap", time.Hour)                                   // want `the error of handler.Sleep\("nap"\) is dropped`
	_, _ = handler.WaitForSignal[string](ctx, "approval", time.Hour)       // want `the error of handler.WaitForSignal\("approval"\) is assigned to _`
	_, _ = handler.Step(ctx, "", charge)                                   // want `a step's name is 1 to 128 bytes`
	_, _ = handler.Step(ctx, "nexjob:mine", charge)                        // want `names beginning "nexjob:" are the package's own`
	_, _ = handler.Step(ctx, fmt.Sprint("at-", time.Now().Unix()), charge) // want `handler.Step\(fmt.Sprint\("at-", time.Now\(\).Unix\(\)\)\): its name is built from time.Now`
	_, _ = handler.Step(ctx, fmt.Sprint("r-", rand.IntN(10)), charge)      // want `built from a random number`
	for tenant := range tenants {
		_, _ = handler.Step(ctx, "t-"+tenant, charge) // want `built from a map's range variable`
	}
	go func() {
		_, _ = handler.Step(ctx, "in-a-goroutine", charge) // want `handler.Step\("in-a-goroutine"\) in a goroutine: use handler.Map`
	}()
	if time.Now().Hour() < 12 { // want `decided by time.Now outside a step`
		_, _ = handler.Step(ctx, "morning", charge)
	}
	_, _ = handler.Step(ctx, "book", func(ctx context.Context) (int, error) {
		_ = handler.Compensate(ctx, "unbook", func(context.Context) error { return nil }) // want `handler.Compensate\("unbook"\) inside handler.Step\("book"\)'s function`
		return 1, nil
	})
	if err := handler.Compensate(ctx, "refund", func(context.Context) error { return nil }); err != nil { // after the step: fine
		return err
	}
	if time.Now().Hour() < 12 { // no step in it: fine
		fmt.Println("morning")
	}
	return nil
}
