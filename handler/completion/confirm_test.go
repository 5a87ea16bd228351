package completion_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	ebtypes "github.com/aws/aws-sdk-go-v2/service/eventbridge/types"

	"github.com/nexjob/nexjob-aws/handler/completion"
	"github.com/nexjob/nexjob-aws/ledger"
)

// TestConfirmTellsAForgedEnd: on a bus others may put events on (the
// account's default bus: any principal with events:PutEvents), a plain
// PutEvents of "refund Succeeded" for a job the ledger holds Failed
// reaches a team's rule as the real ends do. The consumer's check,
// completion.Confirm against the job read by its id, confirms the
// published ends and refuses the forged one (ErrNotConfirmed), and an end
// since undone (the job requeued) is not confirmed any more.
func TestConfirmTellsAForgedEnd(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	ctx := context.Background()
	eb := eventbridge.NewFromConfig(r.e.Cfg)
	if err := r.poller(completion.New(eb, &completion.Options{Bus: r.bus})).Poll(ctx); err != nil {
		t.Fatal(err)
	}
	refund := r.e.Get(t, r.ids[ledger.Failed])
	forged, _ := json.Marshal(completion.Event{EventID: refund.ID + "@1.x", ID: refund.ID, Kind: "refund", State: ledger.Succeeded, Attempt: 1, EndedAt: ledger.Millis(refund.UpdatedAt).UTC()})
	out, err := eb.PutEvents(ctx, &eventbridge.PutEventsInput{Entries: []ebtypes.PutEventsRequestEntry{{
		Source: aws.String(completion.Source), DetailType: aws.String(completion.DetailType), Detail: aws.String(string(forged)), EventBusName: aws.String(r.bus),
	}}})
	if err != nil || out.FailedEntryCount != 0 {
		t.Fatalf("the forged PutEvents: %+v %v", out, err)
	}
	evs, _ := r.delivered(t)
	confirmed, refused := 0, 0
	for _, ev := range evs {
		rec, err := r.e.Client.Store().Get(ctx, ev.ID)
		if err != nil {
			t.Fatal(err)
		}
		switch err := completion.Confirm(rec, ev); {
		case ev.ID == refund.ID && ev.State == ledger.Succeeded:
			var nc *completion.NotConfirmedError
			if !errors.Is(err, completion.ErrNotConfirmed) || !errors.As(err, &nc) || nc.JobID != refund.ID {
				t.Fatalf("the forged end (refund Succeeded, the ledger holds it Failed): %v; want a *NotConfirmedError", err)
			}
			refused++
		case err != nil:
			t.Fatalf("the published end %+v: %v", ev, err)
		default:
			confirmed++
		}
	}
	if confirmed != 2 || refused != 1 {
		t.Fatalf("the rule delivered %d confirmed ends and %d refused; want the 2 published and the forged one", confirmed, refused)
	}
	// An end since undone: the Succeeded charge is requeued.
	var charged completion.Event
	for _, ev := range evs {
		if ev.ID == r.ids[ledger.Succeeded] {
			charged = ev
		}
	}
	if _, err := r.e.Client.Requeue(ctx, charged.ID); err != nil {
		t.Fatal(err)
	}
	rec, err := r.e.Client.Store().Get(ctx, charged.ID)
	if err != nil {
		t.Fatal(err)
	}
	if err := completion.Confirm(rec, charged); !errors.Is(err, completion.ErrNotConfirmed) {
		t.Fatalf("the end of a job since requeued: %v; want it not confirmed", err)
	}
}
