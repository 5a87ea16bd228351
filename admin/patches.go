package admin

import (
	"context"
	"encoding/json"
	"slices"

	"github.com/nexjob/nexjob-aws/ledger"
)

// PatchUse counts the open jobs of kind (Enqueued, Scheduled, Processing,
// AwaitingContinuation) by whether their code knew patch name at their
// first run (handler.Patched): old lack it (they still take the old
// branch: the patch cannot be retired yet; a job that ran before its kind
// had patches counts here too), patched have it, and fresh have not run
// (they record the patches of the code that runs them). Old lists up to 20 of the old jobs' ids. One
// Query of the byState index per page of each state, and one Query of
// each job's steps.
func (a *Admin) PatchUse(ctx context.Context, kind, name string) (old, patched, fresh int, oldIDs []string, err error) {
	err = a.store.OpenJobs(ctx, kind, func(full ledger.Record, _ []ledger.StepItem, _ error) error {
		v, ok := full.Steps["nexjob:patches"]
		var list []string
		switch {
		case !ok && !full.Ran() && len(full.Steps) == 0:
			fresh++
		case json.Unmarshal([]byte(v), &list) == nil && slices.Contains(list, name):
			patched++
		default:
			old++
			if len(oldIDs) < 20 {
				oldIDs = append(oldIDs, full.ID)
			}
		}
		return nil
	})
	if err != nil {
		return 0, 0, 0, nil, err
	}
	return old, patched, fresh, oldIDs, nil
}
