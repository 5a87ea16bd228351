package main

import (
	"context"
	"fmt"

	"github.com/nexjob/nexjob-aws/admin"
)

// moveQueue moves the active jobs whose records name the queue from
// (one taken out of NEXJOB_QUEUES) onto --to ("" the job queue): see
// admin.Admin.MoveQueue. --dry-run lists them (one Scan) and changes
// nothing.
func (o *ops) moveQueue(ctx context.Context, from string, f *flags) error {
	to := "the job queue"
	if f.to != "" {
		to = "queue " + clean(f.to)
	}
	if f.dryRun {
		recs, err := o.a.JobsOnQueue(ctx, from)
		if err != nil {
			return err
		}
		for _, r := range recs {
			fmt.Fprintf(o.stdout, "would move %s (%s, %s) to %s\n", clean(r.ID), r.State, clean(r.Kind), to)
		}
		fmt.Fprintf(o.stdout, "dry run: %d active jobs on queue %s, nothing changed\n", len(recs), clean(from))
		return nil
	}
	if err := o.askBulk(f, fmt.Sprintf("move every active job of queue %s to %s", clean(from), to)); err != nil {
		return err
	}
	rep, err := o.a.MoveQueue(ctx, from, f.to, o.bar("move"))
	if err != nil {
		return err
	}
	o.moved(rep, from, to)
	return rep.Err()
}

// moved prints what MoveQueue did: the count, then each job it left alone.
func (o *ops) moved(rep admin.Report, from, to string) {
	fmt.Fprintf(o.stdout, "moved %d of %d active jobs from queue %s to %s\n", rep.Done(), len(rep.Outcomes), clean(from), to)
	for _, oc := range rep.Outcomes {
		if oc.Skipped != "" {
			fmt.Fprintf(o.stdout, "skipped job %s: %s\n", clean(oc.ID), oc.Skipped)
		}
	}
}
