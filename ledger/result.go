package ledger

import (
	"errors"
	"fmt"
	"unicode/utf8"
)

// MaxResultBytes bounds a run's result (Record.Result, its JSON), in
// bytes. The room is reserved in every record (MaxArgsBytes is that much
// smaller), so a result at the limit fits beside args at theirs; it adds
// up to 16 write units to the Finish that stores it and 4 read units to
// each later read of the record.
const MaxResultBytes = 16 << 10

// ResultRoom is the most bytes of result rec's record takes:
// MaxResultBytes, less for a record written before the room was reserved
// whose args are over today's MaxArgsBytes (so no record's Finish can
// fail for its size).
func ResultRoom(rec Record) int {
	return max(0, min(MaxResultBytes, MaxArgsBytes+MaxResultBytes-len(rec.Args)))
}

// ResultTooLargeError: a run's result is over its record's room
// (ResultRoom). Nothing of it was written; the handler fails the job
// permanently with it. It names the sizes, never the content (a result
// may hold user data).
type ResultTooLargeError struct {
	JobID       string
	Size, Limit int // bytes of JSON, and the most the record takes
}

func (e *ResultTooLargeError) Error() string {
	return fmt.Sprintf("nexjob: the result of job %s is %d bytes of JSON, over the %d a record keeps (ledger.MaxResultBytes)", e.JobID, e.Size, e.Limit)
}

// checkResult refuses a Finish's result that its record cannot keep.
func checkResult(rec Record, f Finish) error {
	switch {
	case f.Result == "":
		return nil
	case f.State != Succeeded:
		return fmt.Errorf("nexjob: a run that ends %s keeps no result", f.State)
	case !utf8.ValidString(f.Result):
		return errNotUTF8
	case len(f.Result) > ResultRoom(rec):
		return &ResultTooLargeError{JobID: rec.ID, Size: len(f.Result), Limit: ResultRoom(rec)}
	}
	return nil
}

var errNotUTF8 = errors.New("nexjob: a result must be UTF-8 (DynamoDB keeps no other string)")
