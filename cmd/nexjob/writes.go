package main

// The operator's commands that write: cancel, requeue (one, many, by
// state) and redrive, with their progress.

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/nexjob/nexjob-aws/admin"
)

func (o *ops) cancel(ctx context.Context, id, reason string) (string, error) {
	rec, err := o.a.Cancel(ctx, id, reason)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("cancelled %s: %s (%s)", clean(rec.ID), rec.State, oneLine(rec.LastError, 200)), nil
}

func (o *ops) requeue(ctx context.Context, id string) (string, error) {
	res, err := o.a.Requeue(ctx, id)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("requeued %s: %s", clean(res.ID), res.State), nil
}

// each runs do for every id, printing one line per success, and returns
// the failures joined, each naming its job once.
func (o *ops) each(ids []string, do func(id string) (string, error)) error {
	var errs []error
	for _, id := range ids {
		line, err := do(id)
		if err != nil {
			if !strings.Contains(err.Error(), id) {
				err = fmt.Errorf("job %s: %w", clean(id), err)
			}
			errs = append(errs, err)
			continue
		}
		fmt.Fprintln(o.stdout, line)
	}
	return errors.Join(errs...)
}

// bulk is each for requeue and delete of listed ids: asked first on a
// terminal (delete always, requeue of more than one), and with --dry-run
// each job is read and named with what would happen to it, nothing
// changed.
func (o *ops) bulk(ctx context.Context, f *flags, verb string, ids []string, do func(id string) (string, error)) error {
	if f.dryRun {
		return o.each(ids, func(id string) (string, error) {
			rec, err := o.a.Get(ctx, id)
			if err != nil {
				return "", err
			}
			return fmt.Sprintf("would %s %s (%s, %s)", verb, clean(rec.ID), rec.State, clean(rec.Kind)), nil
		})
	}
	if verb == "delete" || len(ids) > 1 {
		if err := o.askBulk(f, fmt.Sprintf("%s %d job(s)", verb, len(ids))); err != nil {
			return err
		}
	}
	return o.each(ids, do)
}

// bar draws a progress bar on stderr: in place on a terminal, else one
// line per tenth.
func (o *ops) bar(verb string) admin.Progress {
	last := -1
	return func(done, total int) {
		const width = 30
		fill := width
		if total > 0 {
			fill = done * width / total
		}
		line := fmt.Sprintf("%s [%s%s] %d/%d", verb, strings.Repeat("#", fill), strings.Repeat(".", width-fill), done, total)
		switch {
		case o.tty:
			_, _ = fmt.Fprint(o.stderr, "\r"+line)
			if done == total {
				fmt.Fprintln(o.stderr)
			}
		case total == 0 || done*10/total != last:
			last = done * 10 / max(total, 1)
			fmt.Fprintln(o.stderr, line)
		}
	}
}

func (o *ops) requeueAll(ctx context.Context, f *flags) error {
	flt, err := o.filter(f, "")
	if err != nil {
		return err
	}
	if f.dryRun {
		recs, _, err := o.a.Find(ctx, flt)
		if err != nil {
			return err
		}
		for _, r := range recs {
			fmt.Fprintf(o.stdout, "would requeue %s (%s, %s)\n", clean(r.ID), r.State, clean(r.Kind))
		}
		fmt.Fprintf(o.stdout, "dry run: %d %s jobs listed (the first page), nothing changed\n", len(recs), flt.State)
		return nil
	}
	what := fmt.Sprintf("requeue every %s job", flt.State)
	if flt.Kind != "" {
		what += " of kind " + clean(flt.Kind)
	}
	if err := o.askBulk(f, what); err != nil {
		return err
	}
	rep, err := o.a.RequeueAll(ctx, flt, o.bar("requeue"))
	if err != nil {
		return err
	}
	fmt.Fprintf(o.stdout, "requeued %d of %d %s jobs\n", rep.Done(), len(rep.Outcomes), flt.State)
	for _, oc := range rep.Outcomes {
		if oc.Skipped != "" { // a continuation its parent's requeue brought back
			fmt.Fprintf(o.stdout, "skipped job %s: %s\n", clean(oc.ID), oc.Skipped)
		}
	}
	return rep.Err()
}

func (o *ops) redrive(ctx context.Context, f *flags) error {
	a, err := o.a.OnQueue(f.from)
	if err != nil {
		return err
	}
	if f.dryRun {
		letters, err := a.DeadLetters(ctx, 10) // a peek: visibility 0, nothing hidden
		if err != nil {
			return err
		}
		for _, d := range letters {
			what := "not a job: left in the DLQ"
			if d.Record != nil {
				what = fmt.Sprintf("job %s (%s)", clean(d.Record.ID), d.Record.State)
			}
			fmt.Fprintf(o.stdout, "would redrive message %s: %s\n", clean(d.MessageID), what)
		}
		fmt.Fprintf(o.stdout, "dry run: %d messages shown (at most 10), nothing changed\n", len(letters))
		return nil
	}
	if err := o.askBulk(f, "redrive the dead-letter queue's messages"); err != nil {
		return err
	}
	rep, err := a.Redrive(ctx, o.bar("redrive"))
	if err != nil {
		return err
	}
	fmt.Fprintf(o.stdout, "redrove %d of %d dead-letter messages\n", rep.Done(), len(rep.Outcomes))
	for _, oc := range rep.Outcomes {
		if oc.Skipped != "" {
			fmt.Fprintf(o.stdout, "skipped job %s: %s\n", clean(oc.ID), oc.Skipped)
		}
	}
	err = rep.Err()
	if rep.Hidden > 0 {
		// Never "0 of 0" with exit 0 while the DLQ is not empty.
		err = errors.Join(err, fmt.Errorf("the DLQ still holds %d messages this redrive could not see: they are in flight (received by a consumer or a peek) and visible again when their visibility timeout ends; run redrive again then", rep.Hidden))
	}
	return err
}
